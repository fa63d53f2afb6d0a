"""hearth.companion_rules: the app's rules that the corpus builder follows too, in one bottom-layer module.

Was: hearth.train.corpus imported the app's relationship ladder (hearth.app.relationship), its text limits
(hearth.app.textlimits) and, lazily and guarded by ImportError, hearth.app.settings for the defaults and bounds of
chat_context_turns / prompt_memories / max_text_chars: three upward imports (train is below app). They moved down;
the app's modules take them from here, so both sides hold the very same objects.
"""

from __future__ import annotations

import subprocess
import sys

from hearth import companion_rules as R
from hearth.app import common, relationship, settings, textlimits
from hearth.train import corpus as C


def test_the_app_s_names_are_the_moved_objects():
    assert (relationship.STAGES, relationship.Standing, relationship.standing) == (R.STAGES, R.Standing, R.standing)
    for name in textlimits.__all__:
        assert getattr(textlimits, name) is getattr(R, name), name
    assert common.FORM_TEXT_MAX == R.FORM_TEXT_MAX


def test_the_settings_fields_have_the_shared_default_and_bounds():
    for setting, (default, least, most) in R.SETTING_BOUNDS.items():
        field = settings.AppSettings.model_fields[setting]
        bounds = {k: getattr(m, k) for m in field.metadata for k in ("ge", "le") if hasattr(m, k)}
        assert (field.default, bounds) == (default, {"ge": least, "le": most}), setting
    assert R.SETTING_BOUNDS["max_text_chars"][2] == common.FORM_TEXT_MAX


def test_the_corpus_flags_use_them():
    for flag, setting in C.APP_SETTING_FLAGS.items():
        default, least, most = R.SETTING_BOUNDS[setting]
        assert C.app_setting(flag, None) == default
        assert C.app_setting(flag, least) == least and C.app_setting(flag, most) == most
    assert (C.CHAT_CONTEXT_TURNS, C.PROMPT_MEMORIES) == (R.CHAT_CONTEXT_TURNS, R.PROMPT_MEMORIES)


def test_importing_it_loads_nothing_of_hearth_but_itself():
    probe = ("import sys, hearth.companion_rules; print(sorted(m for m in sys.modules if m.startswith('hearth') "
             "or m.split('.')[0] == 'pydantic'))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert eval(out.stdout) == ["hearth", "hearth.companion_rules"], out.stdout
