"""The conformance kit checks its settings in the calling process, and precisions declare their exactness."""

import pytest

from stratagem import registry
from stratagem.testing.conformance import run_conformance
from stratagem.testing.conformance_checks import check_names


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"resume_steps": (3, 8)}, r"resume_steps=\(3, 8\) is not valid: 8; expected distinct ints between 1 and"),
        ({"resume_steps": (0,)}, r"resume_steps=\(0,\) is not valid: 0"),
        ({"resume_steps": (3, 3)}, r"repeats a step"),
        ({"steps": 1}, r"steps=1 is not valid; expected an int of at least 2"),
        ({"devices": 0}, r"devices=0 is not valid; expected a positive int"),
        ({"tolerance": -1.0}, r"tolerance=-1.0 is not valid"),
        ({"blocks": 2}, r"blocks=2 is not valid; expected an int of at least 3"),
    ],
)
def test_conformance_settings_that_cannot_work_are_refused_before_any_process_starts(settings, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        run_conformance("single_device", workdir=tmp_path, **settings)
    assert not (tmp_path / "out").exists()


def test_strategy_options_that_are_not_json_values_are_refused_naming_the_option(tmp_path):
    with pytest.raises(TypeError, match=r"strategy_options=.* must be JSON values"):
        run_conformance("single_device", workdir=tmp_path, strategy_options={"period": object()})


def test_every_resume_step_is_a_check_of_its_own():
    names = check_names((3, 5))
    assert "resume_from_step_3_continues_exactly" in names
    assert "resume_from_step_5_continues_exactly" in names
    assert len(names) == len(set(names))


@pytest.mark.parametrize(
    ("precision", "exact"),
    [
        ("32-true", True),
        ("64-true", True),
        ("16-true", False),
        ("bf16-true", False),
        ("16-mixed", False),
        ("bf16-mixed", False),
    ],
)
def test_built_in_precisions_declare_whether_they_are_exact(precision, exact):
    assert registry.precisions.create(precision).exact is exact
