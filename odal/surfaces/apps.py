from django.apps import AppConfig


class SurfacesConfig(AppConfig):
    """The surfaces over both apps (the API root, the admin site and its dashboard, live pages,
    the passport lifecycle, odal's own commands): an app for its commands, template tags and
    static files (their URLs stay /static/odal/...)."""

    name = "odal.surfaces"
    label = "odal_surfaces"
    verbose_name = "odal's surfaces"

    def ready(self):
        # Imported here: apps.py loads before the models, which these modules import.
        from odal.core.admin import serve_live_pages
        from odal.surfaces import live

        serve_live_pages(live.OBJECT_KINDS, live.LIST_KINDS, live.page_config)
