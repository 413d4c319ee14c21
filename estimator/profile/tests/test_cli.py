"""python -m carma_profile: output formats, errors (exit 2), and the Rust side accepting it."""

import json
import subprocess
import sys

import pytest
import yaml

from carma_profile.__main__ import main
from conftest import HERE

MODELS = str(HERE / "models.py")


def cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-W", "ignore", "-m", "carma_profile", *args],
                          cwd=HERE.parent, capture_output=True, text=True, input=stdin, timeout=120)


def test_json_annotation_and_yaml_agree():
    r = cli(f"{MODELS}:mlp", "--batch-size", "256", "--input", "32", "--arg", "width=128",
            "--annotation", "--yaml")
    assert r.returncode == 0, r.stderr
    blocks = r.stdout.split("\n\n")
    profile = json.loads(blocks[0])
    assert profile["parameters"] == 32 * 128 + 128 + 128 * 10 + 10
    assert profile["activations"] == 128 + 128 + 10 and profile["batchSize"] == 256
    key, value = blocks[1].strip().split(": ", 1)
    assert key == "carma.io/model-profile"
    assert yaml.safe_load(blocks[1]) == {key: json.dumps(profile, separators=(",", ":"))}
    assert json.loads(yaml.safe_load(blocks[1])[key]) == profile
    spec = yaml.safe_load("spec:\n" + blocks[2])
    assert spec == {"spec": {"modelProfile": profile}}


@pytest.mark.parametrize("args, message", [
    (["nosuchmodule_xyz:build", "--input", "32"], "cannot import module 'nosuchmodule_xyz'"),
    (["nosuchfile.py:build", "--input", "32"], "'nosuchfile.py' does not exist"),
    ([f"{MODELS}:nothing", "--input", "32"], "has no 'nothing'"),
    (["mlp_without_colon", "--input", "32"], "must be MODULE:FACTORY"),
    ([f"{MODELS}:broken", "--input", "32"], "broken failed: RuntimeError: no weights here"),
    ([f"{MODELS}:not_a_module", "--input", "32"], "returned int, not a torch.nn.Module"),
    ([f"{MODELS}:mlp", "--input", "3,x"], "--input '3,x' must be positive integers"),
    ([f"{MODELS}:mlp", "--input", "3,0"], "--input '3,0' must be positive integers"),
    ([f"{MODELS}:mlp", "--input", "16"], "forward pass with batch 1 failed"),
    ([f"{MODELS}:mlp", "--input", "32", "--arg", "width"], "--arg 'width' must be NAME=VALUE"),
    ([f"{MODELS}:mlp", "--input", "32", "--arg", "depth=3"], "unexpected keyword argument 'depth'"),
    ([f"{MODELS}:mlp", "--input", "32", "--family", "cnn"], "does not fit family 'cnn'"),
])
def test_bad_input_exits_2_naming_it(args, message, capsys):
    assert main([*args, "--batch-size", "8"]) == 2
    out, err = capsys.readouterr()
    assert message in err and out == ""


def test_usage_errors_exit_2(capsys):
    for args in ([f"{MODELS}:mlp", "--input", "32"],  # no --batch-size
                 [f"{MODELS}:mlp", "--batch-size", "8"]):  # no input
        with pytest.raises(SystemExit) as e:
            main(args)
        assert e.value.code == 2
    assert main([f"{MODELS}:mlp", "--batch-size", "0", "--input", "32"]) == 2
    assert "batch_size" in capsys.readouterr().err


def test_bad_input_in_a_real_process():
    r = cli("nosuchmodule_xyz:build", "--batch-size", "8", "--input", "32")
    assert r.returncode == 2 and "cannot import module 'nosuchmodule_xyz'" in r.stderr


@pytest.mark.parametrize("args", [
    ["mlp", "--batch-size", "512", "--input", "32"],
    ["MnistNet", "--batch-size", "64", "--input", "1,28,28"],
])
def test_rust_estimator_accepts_the_profile(carma_bin, args):
    r = cli(f"{MODELS}:{args[0]}", *args[1:])
    assert r.returncode == 0, r.stderr
    est = subprocess.run([carma_bin, "estimate", "--profile", "-"], input=r.stdout,
                         capture_output=True, text=True, timeout=60)
    assert est.returncode == 0, est.stderr
    assert json.loads(est.stdout)["estimate_mib"] > 0


def test_without_torch_says_how_to_get_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    assert main([f"{MODELS}:mlp", "--batch-size", "8", "--input", "32"]) == 2
    assert "PyTorch is not installed here: pip install torch" in capsys.readouterr().err


def test_meta_flag_gives_the_same_profile(capsys):
    args = [f"{MODELS}:MnistNet", "--batch-size", "64", "--input", "1,28,28"]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*args, "--meta"]) == 0
    assert json.loads(capsys.readouterr().out) == plain


def test_optimizer_and_mixed_precision_pass_through(capsys, carma_bin):
    args = [f"{MODELS}:mlp", "--batch-size", "8", "--input", "32", "--optimizer", "adamw",
            "--mixed-precision", "--annotation", "--yaml"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    blocks = out.split("\n\n")
    profile = json.loads(blocks[0])
    assert profile["optimizer"] == "adam" and profile["mixedPrecision"] is True
    assert json.loads(yaml.safe_load(blocks[1])["carma.io/model-profile"]) == profile
    # the TrainingTask CRD carries both (crds/trainingtasks.carma.io.yaml)
    block = yaml.safe_load("spec:\n" + blocks[2])["spec"]["modelProfile"]
    assert block["optimizer"] == "adam" and block["mixedPrecision"] is True
    assert err == ""
    est = subprocess.run([carma_bin, "estimate", "--profile", "-"], input=blocks[0],
                         capture_output=True, text=True, timeout=60)
    assert est.returncode == 0, est.stderr
    with pytest.raises(SystemExit) as e:
        main(args[:5] + ["--optimizer", "lbfgs"])
    assert e.value.code == 2 and "invalid choice: 'lbfgs'" in capsys.readouterr().err
