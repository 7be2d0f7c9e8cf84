import os

from django.core.wsgi import get_wsgi_application

from odal.core import database

database.role = database.WEB  # a web request's statements wait ODAL_DB_STATEMENT_SECONDS, or 10 s

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "odal.settings")
application = get_wsgi_application()
