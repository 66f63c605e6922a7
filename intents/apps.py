from django.apps import AppConfig


class IntentsConfig(AppConfig):
    name = "intents"
