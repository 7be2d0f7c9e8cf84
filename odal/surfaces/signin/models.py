from django.conf import settings
from django.db import models


class SignOnSubject(models.Model):
    """The provider's person (issuer and `sub`) an account single sign-on signs in is: names
    (preferred_username, email) may be given to another person or changed; the subject is not."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sign_on_subject"
    )
    issuer = models.CharField(max_length=500)
    subject = models.CharField(max_length=255)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="one_account_per_sign_on_subject")
        ]

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"
