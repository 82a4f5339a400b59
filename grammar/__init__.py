"""The .tile grammar (tile.lark), shipped inside the wheel as package data."""
