"""Kick moves to the odal app (odal/core/migrations/0010): state only, the table stays."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0012_consumer_version"),
        ("odal", "0010_kick_moves_here"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[migrations.DeleteModel(name="Kick")]),
    ]
