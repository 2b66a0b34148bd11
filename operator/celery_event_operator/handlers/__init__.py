"""kopf handlers: importing this package registers them. They stay thin: the logic lives elsewhere."""

from celery_event_operator.handlers import admission, replays, services, startup

__all__ = ["admission", "replays", "services", "startup"]
