from django.db import migrations, models


class Migration(migrations.Migration):
    """Consumer.version: counts every write of what the API shows of a consumer; its ETag."""

    dependencies = [("outbox", "0011_delivery_late_success_at")]

    operations = [
        migrations.AddField(
            model_name="consumer",
            name="version",
            field=models.PositiveIntegerField(default=1, editable=False),
        ),
    ]
