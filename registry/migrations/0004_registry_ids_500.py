"""The registry's ids (requestId, registrationId) as long as real registries make them: up to 500
characters (registry.adapters.MAX_ID; longer ones are refused as a protocol error)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("registry", "0003_stalledregistration")]

    operations = [
        migrations.AlterField(
            model_name="registration",
            name="correlation_id",
            field=models.CharField(blank=True, default="", help_text="The registry's requestId.", max_length=500),
        ),
        migrations.AlterField(
            model_name="registration",
            name="handle",
            field=models.CharField(
                blank=True, default="", help_text="The registry's registrationId.", max_length=500
            ),
        ),
    ]
