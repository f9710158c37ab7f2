"""stratagem-colossalai: ``Trainer(strategy="colossalai")``, Colossal-AI's Booster with a plugin of your choice."""

from stratagem_colossalai.options import LIGHTNING_GEMINI_OPTIONS, PLUGINS, check_plugin_options
from stratagem_colossalai.strategy import ColossalAIStrategy

__all__ = ["LIGHTNING_GEMINI_OPTIONS", "PLUGINS", "ColossalAIStrategy", "check_plugin_options"]
