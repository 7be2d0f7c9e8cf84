from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

from odal import views
from odal.api import api

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("admin/", admin.site.urls),
    path("vault/api/v1/", api.urls),
    path("metrics", views.metrics, name="metrics"),
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
]
