"""The back office's two groups: Operators may replay and resend deliveries, pause and resume
consumers, abandon registrations and record handles (and see everything); Viewers see everything
and change nothing.

The same permissions decide what a staff session may do through the API (odal/core/auth.py), so
Operators may also read, replay, abandon and record handles there. Neither group may create,
publish or suspend passports, or post events (`outbox.post_event`): give those to people by hand.

Created by migration odal/0003; `ensure_groups()` makes them again where a test flushed them."""

from django.contrib.auth.management import create_permissions

VIEW = [
    ("odal", "passport"), ("odal", "auditentry"), ("outbox", "consumer"), ("outbox", "event"),
    ("outbox", "delivery"), ("outbox", "deadletter"), ("registry", "registration"),
    ("registry", "stalledregistration"),
]  # fmt: skip
OPERATE = [
    ("outbox", "replay_delivery"),
    ("outbox", "pause_consumer"),
    ("registry", "abandon_registration"),
    ("registry", "record_handle"),
]


def ensure_groups(apps=None) -> None:
    if apps is None:
        from django.apps import apps
    # Permissions are normally created after all migrations (post_migrate); make sure they exist.
    for app_config in apps.get_app_configs():
        module = getattr(app_config, "models_module", None)
        app_config.models_module = module or True
        create_permissions(app_config, verbosity=0, apps=apps)
        app_config.models_module = module
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    view = [
        Permission.objects.get(content_type__app_label=app, codename=f"view_{model}") for app, model in VIEW
    ]
    # A permission a later migration brings is skipped here; that migration calls this again.
    operate = [
        p
        for app, code in OPERATE
        if (p := Permission.objects.filter(content_type__app_label=app, codename=code).first()) is not None
    ]
    viewers, _ = Group.objects.get_or_create(name="Viewers")
    viewers.permissions.add(*view)
    operators, _ = Group.objects.get_or_create(name="Operators")
    operators.permissions.add(*view, *operate)
