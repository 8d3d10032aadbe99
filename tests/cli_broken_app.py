"""An app module whose own code raises while it is imported (a typo in a user's module)."""

settings: dict[str, str] = {}
SHOP_URL = settings["SHOP_URL"]  # KeyError: the setting is missing
