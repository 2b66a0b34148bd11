"""celery-event-operator: declarative RabbitMQ topology, settings, metrics and scaling for Celery services."""

__version__ = "0.1.0"
