from django.contrib import admin
from django.urls import path

from hermesweb import views
from hermesweb.api import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("login/", views.login, name="login"),
    path("logout/", views.logout, name="logout"),
    path("", views.home, name="home"),
    path("projects/<int:project_id>/", views.project_page, name="project"),
    path("sessions/<int:session_id>/", views.session_page, name="session"),
    path("sessions/<int:session_id>/fragment", views.session_fragment, name="session-fragment"),
    path("sessions/<int:session_id>/runs/<int:run_id>/fragment", views.run_fragment, name="run-fragment"),
]
