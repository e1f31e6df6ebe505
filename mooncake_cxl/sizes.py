"""Size strings as Mooncake's setup(config: dict) accepts them: 16777216, "16MB", "16 MB"."""
import re

_UNITS = {
    "": 1, "B": 1,
    "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10,
    "M": 1 << 20, "MB": 1 << 20, "MIB": 1 << 20,
    "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30,
    "T": 1 << 40, "TB": 1 << 40, "TIB": 1 << 40,
}
_SIZE = re.compile(r"^\s*(\d+)\s*([A-Za-z]*)\s*$")


def parse_size(value):
    """Bytes for an int or a size string; None when the value is not a size
    (negative, fractional, a percentage, an unknown unit, a bool)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if not isinstance(value, str):
        return None
    m = _SIZE.match(value)
    if not m or m.group(2).upper() not in _UNITS:
        return None
    return int(m.group(1)) * _UNITS[m.group(2).upper()]
