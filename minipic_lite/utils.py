"""Small helpers shared across the engine."""


def cdiv(a: int, b: int) -> int:
    """Ceiling division: how many blocks of `b` hold `a` tokens."""
    return -(-a // b)
