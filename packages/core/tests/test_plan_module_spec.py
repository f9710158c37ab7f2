"""``stratagem plan MODULE --init-args ...`` refuses a crafted module path or init-args with one line naming the value
and what is accepted: no traceback, also when the user's own code fails on import, in its constructor or in
``configure_model``."""

from __future__ import annotations

import pytest

from stratagem.cli.main import main

SOURCES = {
    "exits.py": "import argparse\nargparse.ArgumentParser(prog='script').parse_args(['--bogus'])\n",
    "syntax.py": "def broken(:\n",
    "raises.py": "raise RuntimeError('needs a GPU')\n",
    "net.py": (
        "import torch\nfrom torch import nn\nimport stratagem\n"
        "class Net(nn.Module):\n"
        "    def __init__(self, width=4):\n        super().__init__()\n        self.layer = nn.Linear(width, width)\n"
        "class Refuses(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        raise KeyError('weights')\n"
        "class Unconfigurable(stratagem.Module):\n"
        "    def configure_model(self):\n        raise RuntimeError('no config')\n"
        "not_a_class = Net()\n"
    ),
}

CASES = [
    (["nocolon"], "MODULE='nocolon' is not valid; expected package.module:Class or path/to/file.py:Class"),
    (["torch.nn:"], "MODULE='torch.nn:' is not valid"),
    ([".relative:Net"], "'.relative' is not an absolute module name"),
    (["json:JSONDecoder"], "json:JSONDecoder is a class, but not a torch.nn.Module subclass"),
    (["os.path:join"], "os.path:join is a function, not a class"),
    (["torch.nn:Nope"], "torch.nn has no attribute 'Nope'"),
    (["no_such_package_here:Net"], "cannot import no_such_package_here (No module named 'no_such_package_here')"),
    (["{dir}/missing.py:Net"], "missing.py is not a file"),
    (["{dir}/exits.py:Net"], "running {dir}/exits.py raised SystemExit: 2"),
    (["{dir}/syntax.py:Net"], "running {dir}/syntax.py raised SyntaxError: invalid syntax (at syntax.py:1)"),
    (["{dir}/raises.py:Net"], "running {dir}/raises.py raised RuntimeError: needs a GPU (at raises.py:1)"),
    (["{dir}/net.py:not_a_class"], "net.py:not_a_class is a Net, not a class"),
    (["{dir}/net.py:Refuses"], "Refuses(...) raised KeyError: 'weights' (at net.py:11)"),
    (
        ["{dir}/net.py:Unconfigurable", "--accelerator", "cpu", "--devices", "1"],
        "Unconfigurable.configure_model() failed on the meta device: RuntimeError: no config (at net.py:14)",
    ),
    (["{dir}/net.py:Net", "--init-args", "{width: 8}"], "--init-args='{width: 8}': not valid JSON (Expecting"),
    (["{dir}/net.py:Net", "--init-args", "null"], "--init-args='null' is not valid; expected a JSON object"),
    (
        ["{dir}/net.py:Net", "--init-args", '{"widht": 8}'],
        "Net(width=4) cannot be created with these keyword arguments (got an unexpected keyword argument 'widht')",
    ),
    (
        ["torch.nn:Linear", "--init-args", '{"in_features": -1, "out_features": 2}'],
        "Linear(...) raised RuntimeError: Trying to create tensor with negative dimension",
    ),
    (
        ["stratagem.demo.llama:LlamaModule", "--init-args", '{"size": "9b"}', "--world-size", "8"],
        "LlamaModule(...) raised ValueError: size='9b' is not valid; expected one of '8b', '70b', 'tiny'.",
    ),
]


@pytest.mark.parametrize(("argv", "message"), CASES, ids=[" ".join(argv) for argv, _ in CASES])
def test_plan_refuses_a_crafted_module_or_init_args_in_one_line_without_a_traceback(tmp_path, capsys, argv, message):
    for name, text in SOURCES.items():
        (tmp_path / name).write_text(text)
    assert main(["plan", *(argument.replace("{dir}", str(tmp_path)) for argument in argv)]) == 2
    error = capsys.readouterr().err
    assert message.replace("{dir}", str(tmp_path)) in error
    assert "Traceback" not in error
    assert error.startswith(("stratagem plan: error: ", "usage: script"))
