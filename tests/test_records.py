"""attention_ref.records: live where the frameworks import, recorded where they do not, and how it records."""

import json

import pytest

from attention_ref.records import ENVIRONMENT_VARIABLE, FrameworkRecord

MISSING = "attention_ref_no_such_framework"  # an import name nothing provides
RECORDED = {"page": {"versions": {MISSING: "1.0", "numpy": "2.0"}, "cases": {"sum": {"total": 3.0, "kind": "exact"}}}}


def test_missing_framework_reads_the_record_and_never_runs():
    record = FrameworkRecord("page", RECORDED, needs=(MISSING,))
    assert not record.live and record.versions == RECORDED["page"]["versions"]

    def run():
        raise AssertionError("a recorded case must not run")

    assert record.take("sum", run) == {"total": 3.0, "kind": "exact"}
    assert record.measured == {"sum": {"total": 3.0, "kind": "exact"}}
    assert record.note() == f"are recorded: computed with {MISSING} 1.0 on a machine that had it"


def test_installed_framework_runs_live_and_names_its_version():
    import numpy as np

    record = FrameworkRecord("page", {}, needs=("numpy",))     # no section needed when live
    assert record.live and record.versions["numpy"] == np.__version__ and "attention_ref" in record.versions
    assert record.take("sum", lambda: {"total": 1.0 + 2.0}) == {"total": 3.0}
    assert record.note() == (f"ran live when this page was made, with numpy {np.__version__}; a run without it "
                             "takes the recorded results instead")


def test_an_installed_framework_older_than_at_least_means_recorded():
    import numpy as np

    recorded = {"page": {"versions": {"numpy": "999.0"}, "cases": {"sum": {"total": 3.0}}}}
    too_old = FrameworkRecord("page", recorded, needs=("numpy",), at_least={"numpy": "999"})
    assert not too_old.live and too_old.take("sum", dict) == {"total": 3.0}
    recent = FrameworkRecord("page", recorded, needs=("numpy",), at_least={"numpy": np.__version__})
    assert recent.live and recent.versions["numpy"] == np.__version__
    assert FrameworkRecord("page", recorded, needs=("numpy",), at_least={"numpy": "1.0"}).live


def test_at_least_is_checked():
    with pytest.raises(ValueError, match=r"at_least names frameworks outside needs \['numpy'\]: \['torch'\]"):
        FrameworkRecord("page", {}, needs=("numpy",), at_least={"torch": "2.0"})
    with pytest.raises(ValueError, match=r"must start with its release numbers.*got 'latest'"):
        FrameworkRecord("page", {}, needs=("numpy",), at_least={"numpy": "latest"})


@pytest.mark.parametrize(("version", "release"), [("2.13.0+cpu", (2, 13, 0)), ("5.23", (5, 23)),
                                                  ("5.0.0rc1", (5, 0, 0)), ("0.10.2", (0, 10, 2))])
def test_release_numbers(version, release):
    from attention_ref.records import release_numbers

    assert release_numbers(version) == release
    assert release_numbers("5.9") < release_numbers("5.23")  # compared as numbers, not text


def test_one_missing_framework_of_two_means_recorded():
    recorded = {"page": {"versions": {"numpy": "2.0", MISSING: "1.0"}, "cases": {}}}
    record = FrameworkRecord("page", recorded, needs=("numpy", MISSING))
    assert not record.live
    assert record.frameworks() == f"numpy 2.0 and {MISSING} 1.0"
    assert record.note().endswith("on a machine that had them")


def test_display_names():
    recorded = {"page": {"versions": {"torch": "2.5.1", "jax": "0.4.35"}, "cases": {}}}
    record = FrameworkRecord("page", recorded, needs=("torch", MISSING, "jax"))
    record.versions[MISSING] = "1.0"
    assert record.frameworks() == f"PyTorch 2.5.1, {MISSING} 1.0 and JAX 0.4.35"


def test_unknown_page_or_case_and_no_needs_are_errors():
    with pytest.raises(ValueError, match=r"no section for page 'other'; it has \['page'\]"):
        FrameworkRecord("other", RECORDED, needs=(MISSING,))
    with pytest.raises(ValueError, match=r"has no case 'product'; it has \['sum'\]"):
        FrameworkRecord("page", RECORDED, needs=(MISSING,)).take("product", dict)
    with pytest.raises(ValueError, match="needs must name at least one framework"):
        FrameworkRecord("page", RECORDED, needs=())


def test_save_writes_its_section_and_keeps_the_others(tmp_path):
    target = tmp_path / "record.json"
    target.write_text(json.dumps({"other": {"versions": {}, "cases": {"x": {"y": 1}}}}))
    record = FrameworkRecord("page", {}, needs=("numpy",))
    record.take("row", lambda: {"row": [0.5, 0.0], "empty": "NaN"})
    assert record.save_if_requested({}) is None and json.loads(target.read_text()).keys() == {"other"}
    assert record.save_if_requested({ENVIRONMENT_VARIABLE: str(target)}) == target
    saved = json.loads(target.read_text())
    assert list(saved) == ["other", "page"] and saved["page"]["versions"] == record.versions
    # Read back, a recorded run gives what the live one measured.
    assert FrameworkRecord("page", saved, needs=(MISSING,)).take("row", dict) == record.measured["row"]


def test_nan_is_not_recorded(tmp_path):
    # A notebook carries the record as a Python literal, where nan is not a name: results must be strict JSON.
    record = FrameworkRecord("page", {}, needs=("numpy",))
    record.take("row", lambda: {"row": [float("nan")]})
    with pytest.raises(ValueError, match=r"results of page 'page' must be strict JSON .*describe a NaN"):
        record.save_if_requested({ENVIRONMENT_VARIABLE: str(tmp_path / "record.json")})
    assert not (tmp_path / "record.json").exists()


def test_only_a_live_run_records(tmp_path):
    record = FrameworkRecord("page", RECORDED, needs=(MISSING,))
    with pytest.raises(RuntimeError, match=f"{MISSING} cannot all be imported: only a live run can record"):
        record.save_if_requested({ENVIRONMENT_VARIABLE: str(tmp_path / "record.json")})
    assert not (tmp_path / "record.json").exists()


def test_a_live_result_equal_to_rounding_reads_as_recorded_and_a_real_change_does_not():
    from attention_ref.records import FrameworkRecord, same_to_rounding

    recorded = {"page": {"versions": {"numpy": "0"}, "cases": {"c": {"diff": 3.3e-16, "row": "zeros"}}}}
    record = FrameworkRecord("page", recorded, needs=("numpy",))
    assert record.live
    assert record.take("c", lambda: {"diff": 4.4e-16, "row": "zeros"}) == {"diff": 3.3e-16, "row": "zeros"}
    assert record.take("c", lambda: {"diff": 4.4e-15, "row": "zeros"}) == {"diff": 4.4e-15, "row": "zeros"}
    assert record.take("c", lambda: {"diff": 3.3e-16, "row": "NaN"}) == {"diff": 3.3e-16, "row": "NaN"}
    assert record.take("new", lambda: {"diff": 1.0}) == {"diff": 1.0}
    assert same_to_rounding([1.0, {"a": 2.0}], (1.0 + 2**-52, {"a": 2.0}))
    assert not same_to_rounding({"a": 1.0}, {"a": 1.0, "b": 2.0})
    assert not same_to_rounding(1.0, 1.0 + 1e-12)
    assert not same_to_rounding(True, 1.0)
    # A float32 computation's difference moves by float32 rounding on another CPU: the same at that precision.
    f32 = {"page": {"versions": {"numpy": "0"}, "cases": {"jax": {"diff": 1.7e-07}}}}
    record32 = FrameworkRecord("page", f32, needs=("numpy",))
    assert record32.take("jax", lambda: {"diff": 1.2e-07}) == {"diff": 1.2e-07}
    assert record32.take("jax", lambda: {"diff": 1.2e-07}, precision="float32") == {"diff": 1.7e-07}
    assert record32.take("jax", lambda: {"diff": 1.2e-05}, precision="float32") == {"diff": 1.2e-05}
    assert same_to_rounding([1.0], [1.0 + 2**-22], precision="float32")
    assert not same_to_rounding([1.0], [1.0 + 2**-19], precision="float32")
    with pytest.raises(ValueError, match="precision must be 'float64' or 'float32', got 'float16'"):
        same_to_rounding(1.0, 1.0, precision="float16")
