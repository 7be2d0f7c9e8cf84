import importlib

from django.apps import AppConfig
from django.db.models.signals import post_migrate


def reinstall_sqlite_tally_triggers(sender, using="default", **kwargs):
    """SQLite: put the tally's triggers (migration odal 0005) back after every migrate. Django
    alters a SQLite table by making a new one and copying the rows over, which drops the old
    table's triggers: without this, the counts would stop after any later migration that
    touches a counted table. (PostgreSQL alters tables in place; its triggers stay.)"""
    from django.db import connections

    connection = connections[using]
    if connection.vendor != "sqlite":
        return
    tables = set(connection.introspection.table_names())
    if "odal_tally" not in tables:  # (migrated back before 0005)
        return
    tally = importlib.import_module("odal.migrations.0005_tally_and_heartbeats")
    with connection.cursor() as cursor:
        for name in tally.LITE_TRIGGERS:
            cursor.execute(f"DROP TRIGGER IF EXISTS {name}")
        for statement in tally.LITE:
            cursor.execute(statement)


class OdalConfig(AppConfig):
    name = "odal"
    verbose_name = "Passports and audit"

    def ready(self):
        from django.conf import settings
        from django.contrib import admin

        from odal.admin import check_every_list
        from odal.checks import refuse_deploy_errors, register_checks
        from odal.record import superusers_only

        register_checks()  # odal.W001, on every start and in `odal check`
        # Every app's admin is registered by now (the admin app's ready came first, and ran autodiscover).
        check_every_list(admin.site)
        superusers_only(admin.site, "django_q")  # its task tables are internals
        if settings.PRODUCTION:
            refuse_deploy_errors()
        post_migrate.connect(reinstall_sqlite_tally_triggers, sender=self)
