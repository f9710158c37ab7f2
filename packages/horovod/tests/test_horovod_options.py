"""horovod's options are checked in the calling process, before any rank starts."""

import pytest

import stratagem
from stratagem_horovod import HorovodStrategy
from stratagem_horovod.environment import HorovodrunEnvironment


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"compression": "bf16"}, ValueError, r"compression='bf16'\) is not valid; expected one of 'none', 'fp16'"),
        (
            {"gradient_predivide_factor": 0},
            ValueError,
            r"gradient_predivide_factor=0\) is not valid; expected a positive",
        ),
        (
            {"gradient_predivide_factor": "2"},
            TypeError,
            r"gradient_predivide_factor='2'\) is not valid; expected a number",
        ),
        ({"gloo_iface": ""}, TypeError, r"gloo_iface=''\) is not valid; expected a network interface name"),
        ({"start_method": "threads"}, ValueError, r"start_method='threads' is not valid"),
    ],
)
def test_invalid_option_values_name_the_option_and_what_is_accepted(options, error, message):
    with pytest.raises(error, match=message):
        HorovodStrategy(**options)


def test_several_nodes_without_a_network_interface_are_refused_at_trainer_construction(monkeypatch):
    monkeypatch.delenv("HOROVOD_GLOO_IFACE", raising=False)
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29556", "NODE_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=r"num_nodes=2 needs the network interface .* gloo_iface='eth0'"):
        stratagem.Trainer(strategy="horovod", accelerator="cpu", devices=2, num_nodes=2)


def test_the_registered_name_takes_the_options_users_pass():
    trainer = stratagem.Trainer(
        strategy=HorovodStrategy(compression="fp16", gradient_predivide_factor=2.0),
        accelerator="cpu",
        devices=2,
        logger=False,
    )
    assert (trainer.strategy.compression, trainer.strategy.gradient_predivide_factor) == ("fp16", 2.0)
    assert trainer.world_size == 2


def _as_started_by_horovodrun(monkeypatch, rank: int, size: int = 2) -> None:
    for name, value in {
        "HOROVOD_RANK": rank,
        "HOROVOD_SIZE": size,
        "HOROVOD_LOCAL_RANK": rank,
        "HOROVOD_CROSS_RANK": 0,
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
        "MASTER_PORT": 29555,
    }.items():
        monkeypatch.setenv(name, str(value))


def test_ranks_started_by_horovodrun_are_joined_not_started_again(monkeypatch):
    _as_started_by_horovodrun(monkeypatch, rank=1)
    trainer = stratagem.Trainer(strategy="horovod", accelerator="cpu", devices=2, logger=False)
    environment = trainer.strategy.cluster_environment
    assert isinstance(environment, HorovodrunEnvironment)
    assert environment.creates_processes_externally
    assert (trainer.global_rank, trainer.world_size, environment.main_port) == (1, 2, 29555)


@pytest.mark.filterwarnings("ignore:devices=3 starts 3 CPU processes")
def test_devices_that_contradict_horovodruns_ranks_are_refused(monkeypatch):
    _as_started_by_horovodrun(monkeypatch, rank=0)
    with pytest.raises(ValueError, match=r"devices=3 x num_nodes=1 does not match the 2 ranks horovodrun started"):
        stratagem.Trainer(strategy="horovod", accelerator="cpu", devices=3)


def test_without_horovod_the_error_names_the_build_recipe(monkeypatch):
    from stratagem_horovod import options

    found = options.importlib.util.find_spec
    monkeypatch.setattr(options.importlib.util, "find_spec", lambda name: None if name == "horovod" else found(name))
    with pytest.raises(ImportError, match=r"needs horovod, which is not installed.*python tools/build_horovod.py"):
        HorovodStrategy()


def test_bfloat16_parameters_are_refused_at_trainer_construction_naming_what_works():
    with pytest.raises(ValueError, match=r"horovod 0.28.1's PyTorch collectives refuse bfloat16 .* Use 'bf16-mixed'"):
        stratagem.Trainer(strategy="horovod", accelerator="cpu", devices=2, precision="bf16-true")
