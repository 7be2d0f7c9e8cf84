"""`odal migrate`: Django's, one at a time per database.

Two migrates at once (two `make run` started together on an empty var/, replicas that each
migrate as they start) would both read what is applied before either writes, both apply the same
migration, and the second would end in a traceback (`duplicate key value violates unique
constraint "pg_type_typname_nsp_index"`). A session advisory lock taken before anything is read
makes the second wait for the first, then find everything applied."""

from django.core.management.commands.migrate import Command as DjangoMigrate
from django.db import connections

# pg_advisory_lock's key: odal's ("odal" in ASCII), apart from odal.work.wake's listeners (1, 2):
# a running sweep's listener holds its key for its life, and a migrate must not wait for it
MIGRATE_LOCK = 0x6F64616C_0010


class Command(DjangoMigrate):
    def handle(self, *args, **options):
        connection = connections[options["database"]]
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [MIGRATE_LOCK])
            if not cursor.fetchone()[0]:
                self.stderr.write("another `odal migrate` is running on this database: waiting for it to end")
                cursor.execute("SELECT pg_advisory_lock(%s)", [MIGRATE_LOCK])
        try:
            return super().handle(*args, **options)
        finally:
            if connection.connection is not None:  # (a connection that went took its lock with it)
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(%s)", [MIGRATE_LOCK])
