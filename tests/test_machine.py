from servelab import machine


def test_describe_records_machine_versions_and_threads():
    info = machine.describe(packages=("numpy", "surely-not-a-package"), threads=1)
    assert info["threads"] == 1 and info["cpu"] and info["python"].startswith("3.")
    assert info["numpy"][0].isdigit() and info["surely-not-a-package"] == "not installed"
