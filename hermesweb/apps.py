from __future__ import annotations

import logging
from typing import Any

from django.apps import AppConfig
from django.contrib.auth.signals import user_logged_in

log = logging.getLogger("hermesweb")


def forget_initial_password(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    """Remove `initial-password` once the user it was made for has signed in with it.

    It is a password in a file: kept only until it has served. Only a superuser's sign-in is
    checked (bootstrap makes one), and only while the file exists.
    """
    from hermesweb.private_files import initial_password_file

    if not user.is_superuser:
        return
    path = initial_password_file()
    try:
        password = path.read_text().strip()
    except FileNotFoundError:
        return
    if user.check_password(password):
        path.unlink(missing_ok=True)
        log.info("removed %s: %s has signed in", path, user.get_username())


class HermeswebConfig(AppConfig):
    name = "hermesweb"
    verbose_name = "Workbench"

    def ready(self) -> None:
        user_logged_in.connect(forget_initial_password, dispatch_uid="hermesweb.forget_initial_password")
