"""The units of a 4x4 grid (cell indices 0-15, row-major) and ``units_ok``, for the demo tests'
brute-force references, written independently of examples/demo (which derives its own)."""

ROWS = [[4 * r + c for c in range(4)] for r in range(4)]
COLS = [[4 * r + c for r in range(4)] for c in range(4)]
BOXES = [[4 * (2 * br + dr) + 2 * bc + dc for dr in (0, 1) for dc in (0, 1)]
         for br in (0, 1) for bc in (0, 1)]


def units_ok(grid: str, units) -> bool:
    """Each of ``units`` holds 1-4 once in ``grid``."""
    return all(sorted(grid[i] for i in u) == list("1234") for u in units)
