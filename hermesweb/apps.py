from django.apps import AppConfig


class HermeswebConfig(AppConfig):
    name = "hermesweb"
    verbose_name = "Workbench"
