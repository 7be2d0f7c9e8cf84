from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('odal', '0006_idempotency_records'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='passport',
            index=models.Index(fields=['-created_at', '-id'], name='passport_listing_idx'),
        ),
    ]
