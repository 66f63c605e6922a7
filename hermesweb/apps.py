from __future__ import annotations

import logging
from typing import Any

from django.apps import AppConfig
from django.contrib.auth.signals import user_logged_in, user_logged_out
from django.db.models.signals import post_delete, post_init, post_save

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
        # A sign-in that ends closes its sockets within seconds (docs/security.md).
        from django.contrib.auth import get_user_model

        from hermesweb import auth

        user_model = get_user_model()
        user_logged_out.connect(auth.on_logged_out, dispatch_uid="hermesweb.sockets_on_logout")
        post_init.connect(
            auth.remember_sign_in_fields, sender=user_model, dispatch_uid="hermesweb.sign_in_fields"
        )
        post_save.connect(
            auth.on_user_saved, sender=user_model, dispatch_uid="hermesweb.sockets_on_user_saved"
        )
        post_delete.connect(
            auth.on_user_deleted, sender=user_model, dispatch_uid="hermesweb.sockets_on_user_deleted"
        )
        # A new password or a deactivation revokes the user's API tokens (hermesweb/tokens.py).
        from hermesweb import tokens

        post_init.connect(
            tokens.remember_credentials, sender=user_model, dispatch_uid="hermesweb.token_credentials"
        )
        post_save.connect(
            tokens.revoke_on_credentials_change,
            sender=user_model,
            dispatch_uid="hermesweb.tokens_on_user_saved",
        )
