from ninja import NinjaAPI

api = NinjaAPI(title="hermesweb", version="1")
