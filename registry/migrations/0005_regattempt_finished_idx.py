"""An index for retention (outbox.retention): the registry's attempt lines by when they finished,
so each batch of the purge reads a range of it instead of the whole table."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("registry", "0004_registry_ids_500")]

    operations = [
        migrations.AddIndex(
            model_name="registrationattempt",
            index=models.Index(fields=["finished_at", "id"], name="regattempt_finished_idx"),
        ),
    ]
