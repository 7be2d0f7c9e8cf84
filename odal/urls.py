from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

from odal.core.admin import view_on_site
from odal.surfaces import live, second_factor_views, views
from odal.surfaces.api import api
from odal.surfaces.signin import pages, sso

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    # (before the admin's own: its "view on site" answered an id of the wrong form with a 500)
    path("admin/r/<path:content_type_id>/<path:object_id>/", admin.site.admin_view(view_on_site)),
    # The stamps live pages poll (odal.surfaces.live), before the admin's own catch-all.
    path("admin/odal/live/<slug:kind>/", admin.site.admin_view(live.stamp_view), name="odal_live"),
    path(
        "admin/odal/live/<slug:kind>/<str:pk>/",
        admin.site.admin_view(live.stamp_view),
        name="odal_live_object",
    ),
    # Sign-in (odal.surfaces.signin): the admin's login page with the lock's sentence and single
    # sign-on's button, and single sign-on's two steps (404 while it is off).
    path("admin/login/", pages.login),
    path("admin/sso/start/", sso.SignOnStart.as_view(), name="oidc_authentication_init"),
    path("admin/sso/callback/", sso.SignOnCallback.as_view(), name="oidc_authentication_callback"),
    # The second factor's pages (odal.core.second_factor), the only admin pages a session that owes it sees.
    path(
        "admin/second-factor/",
        admin.site.admin_view(second_factor_views.enrol_view),
        name="odal_second_factor",
    ),
    path(
        "admin/second-factor/code/",
        admin.site.admin_view(second_factor_views.code_view),
        name="odal_second_factor_code",
    ),
    path("admin/", admin.site.urls),
    path("vault/api/v1/", api.urls),
    path("metrics", views.metrics, name="metrics"),
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
]
