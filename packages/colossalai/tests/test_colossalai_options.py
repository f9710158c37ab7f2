"""colossalai's options are checked in the calling process: the plugin, its options, Lightning's spellings."""

import inspect
import warnings

import pytest

import stratagem
from stratagem_colossalai import ColossalAIStrategy
from stratagem_colossalai.options import LIGHTNING_GEMINI_OPTIONS, LIGHTNING_REMOVED_OPTIONS, PLUGINS


@pytest.mark.parametrize("plugin", ["gemini", "low_level_zero", "torch_fsdp"])
def test_cuda_only_plugins_are_refused_on_cpu_at_trainer_construction_with_the_reason(plugin):
    with pytest.raises(ValueError, match=rf"plugin='{plugin}'\) cannot run on accelerator='cpu'.*needs CUDA \(.+\)"):
        stratagem.Trainer(strategy=ColossalAIStrategy(plugin=plugin), accelerator="cpu", devices=2)


def test_the_registered_name_trains_with_the_ddp_plugin_by_default():
    trainer = stratagem.Trainer(strategy="colossalai", accelerator="cpu", devices=2, logger=False)
    assert trainer.strategy.plugin == "ddp"
    assert trainer.strategy.plugin_options == {}


def test_an_unknown_plugin_names_the_accepted_ones():
    with pytest.raises(ValueError, match=r"plugin='zero'\) is not a plugin; expected 'auto' .* 'ddp', 'gemini'"):
        ColossalAIStrategy(plugin="zero")


def test_plugin_options_the_plugin_does_not_take_name_the_ones_it_does():
    with pytest.raises(TypeError, match=r"TorchDDPPlugin does not take: bucket_size; it takes broadcast_buffers"):
        ColossalAIStrategy(plugin_options={"bucket_size": 1})


def test_plugin_options_reach_the_plugin():
    strategy = ColossalAIStrategy(plugin="ddp", plugin_options={"bucket_cap_mb": 1, "find_unused_parameters": True})
    assert strategy.plugin_options == {"bucket_cap_mb": 1, "find_unused_parameters": True}


def test_parallel_options_reach_parallel_strategy_beside_the_plugins():
    strategy = ColossalAIStrategy(plugin_options={"bucket_cap_mb": 1}, timeout=12, start_method="spawn")
    assert (strategy.timeout.total_seconds(), strategy.start_method) == (12, "spawn")
    assert strategy.plugin_options == {"bucket_cap_mb": 1}


def test_lightnings_gemini_options_are_accepted_as_gemini_options():
    options = {
        "placement_policy": "auto",
        "force_outputs_fp32": True,
        "gpu_margin_mem_ratio": 0.5,
        "initial_scale": 2**8,
    }
    strategy = ColossalAIStrategy(**options)
    assert strategy.plugin == "gemini"
    assert strategy.plugin_options == options


def test_lightnings_gemini_options_with_another_plugin_are_refused():
    with pytest.raises(ValueError, match=r"hysteresis\) are Gemini's options .* plugin='ddp' does not take them"):
        ColossalAIStrategy(plugin="ddp", hysteresis=2)


@pytest.mark.parametrize(
    ("option", "replacement"),
    [
        ("use_chunk", "always keeps parameters in chunks"),
        ("chunk_size", "search_range_m and min_chunk_size_m, or give chunk_config_dict"),
        ("enable_distributed_storage", "shard_param_frac"),
        ("chunk_search_range", "search_range_m"),
        ("chunk_search_n_grids", "hidden_dim"),
        ("min_chunk_size", "min_chunk_size_m"),
    ],
)
def test_lightning_options_colossalai_removed_are_refused_naming_the_replacement(option, replacement):
    with pytest.raises(ValueError, match=rf"does not take Lightning's {option}=1: .*{replacement}"):
        ColossalAIStrategy(**{option: 1})


@pytest.mark.parametrize("placement", ["cpu", "cuda"])
def test_lightnings_placement_policies_name_their_static_spelling(placement):
    with pytest.raises(
        ValueError, match=rf"placement_policy='{placement}'\) is Lightning's .* placement_policy='static' with"
    ):
        ColossalAIStrategy(placement_policy=placement)


def test_an_unknown_keyword_is_a_type_error_listing_what_is_taken():
    with pytest.raises(TypeError, match=r"unexpected keyword arguments chunk_sise; .* placement_policy"):
        ColossalAIStrategy(chunk_sise=1)


def test_the_option_tables_match_the_installed_colossalai():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from colossalai.booster import plugin as plugins

    for name, spec in PLUGINS.items():
        parameters = tuple(inspect.signature(getattr(plugins, spec.class_name)).parameters)
        assert spec.options == parameters, name
    gemini = PLUGINS["gemini"].options
    assert set(LIGHTNING_GEMINI_OPTIONS) <= set(gemini)
    assert not set(LIGHTNING_REMOVED_OPTIONS) & set(gemini)


def test_without_colossalai_the_error_gives_the_no_deps_install(monkeypatch):
    from stratagem_colossalai import options

    found = options.importlib.util.find_spec
    monkeypatch.setattr(options.importlib.util, "find_spec", lambda name: None if name == "colossalai" else found(name))
    with pytest.raises(ImportError, match=r"needs colossalai, which is not installed.*--no-deps colossalai==0.5.0"):
        ColossalAIStrategy()
