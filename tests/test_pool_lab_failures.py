"""The pool lab's famous failures break their check in the lab too.

Found by the cold read of chapter 23: the seats slider clamped the memory
wall's 400 seats to 128, so the loaded failure passed every check.
"""
from servelab import pool


def _html(widget) -> str:
    out = []
    for child in getattr(widget, "children", ()):
        out.append(_html(child))
    value = getattr(widget, "value", "")
    return " ".join(out + ([value] if isinstance(value, str) else []))


def test_pool_lab_each_famous_failure_breaks_its_check_in_the_lab():
    from servelab.widgets.pool_lab import pool_lab
    lab = pool_lab()
    failures, fix = next(c for c in lab.children if c.__class__.__name__ == "HBox").children
    for key, f in pool.FAMOUS_FAILURES.items():
        failures.value = key
        assert f"{f.check} FAIL" in _html(lab), key
        fix.click()
        assert "FAIL" not in _html(lab).split("Same config, the other workload")[0], key
        failures.value = ""


def test_pool_lab_header_reads_the_workload():
    from servelab.widgets.pool_lab import pool_lab
    w = pool.WORKLOADS["chat"]
    assert f"${w.budget_usd_per_month:,.0f} a month" in _html(pool_lab())
