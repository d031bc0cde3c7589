"""The terminal's line per finished step: a check that did not pass says so, with its reason."""

from dagster import AssetCheckResult, AssetCheckSeverity, Definitions, asset, asset_check, define_asset_job

from incremental_assets.lib.logs import cli_logger


@asset
def rows() -> int:
    return 1


@asset_check(asset=rows)
def rows_wait() -> AssetCheckResult:
    return AssetCheckResult(passed=False, severity=AssetCheckSeverity.WARN, description="3 source rows wait for a keyhole run")


@asset_check(asset=rows)
def rows_are_fine() -> AssetCheckResult:
    return AssetCheckResult(passed=True, severity=AssetCheckSeverity.WARN, description="nothing waits")


@asset_check(asset=rows)
def rows_are_wrong() -> AssetCheckResult:
    return AssetCheckResult(passed=False, description="2 rows are wrong")  # ERROR severity, not blocking


def test_a_check_that_did_not_pass_prints_its_severity_and_reason_and_one_that_passed_ok(tmp_path, capsys):
    defs = Definitions(assets=[rows], asset_checks=[rows_wait, rows_are_fine, rows_are_wrong],
                       jobs=[define_asset_job("job")], loggers={"cli": cli_logger})
    config = {"loggers": {"cli": {"config": {"path": str(tmp_path / "events.log")}}}}
    assert defs.resolve_job_def("job").execute_in_process(run_config=config).success
    lines = {line.split()[0]: line.split(None, 2)[2] for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert lines == {
        "rows": "ok",
        "rows_rows_wait": "warn  3 source rows wait for a keyhole run",
        "rows_rows_are_fine": "ok",
        "rows_rows_are_wrong": "error  2 rows are wrong",
    }
