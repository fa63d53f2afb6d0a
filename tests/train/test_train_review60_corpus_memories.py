"""Review 60 (train): a conversation's starting ``memories`` are taken as the app holds them.

The app stores a companion's memories only from its replies' envelopes (companions.save_turn), each stripped and
1..300 characters (hearth.envelope's Memory). Was: the corpus builder took the starting list as written, so
- a padded memory ("  Likes tea.  ") stayed padded, and a reply that listed the same fact ("Likes tea.") did not
  match it (the app compares the stored, stripped text): the next prompt carried the memory twice;
- an empty memory, or one over 300 characters, trained a prompt the app never sends (an empty one also took one of
  the prompt_memories places the app fills with a real memory).
"""

from __future__ import annotations

import json

import pytest

from hearth.train.corpus import read_corpus
from tests.train.test_train_review52l_corpus_input import GOOD


def _conv(memories: list, listed: list[str] = ()) -> str:
    conv = json.loads(GOOD)
    conv["memories"] = memories
    conv["turns"][1]["envelope"]["memories"] = list(listed)
    return json.dumps(conv)


def test_a_padded_memory_is_the_stripped_one_the_app_stored():
    result = read_corpus([_conv(["  Tama likes tea.  "], listed=["Tama likes tea."])])
    assert not result.rejected, result.rejected
    first, second = result.examples
    assert first.rendered.text.count("- Tama likes tea.\n") == 1
    assert second.rendered.text.count("Tama likes tea.") == 1  # the reply's copy is the memory the app has


@pytest.mark.parametrize("memory", ["", "   ", "x" * 301])
def test_a_memory_the_app_cannot_store_is_a_rejected_line_naming_it(memory):
    result = read_corpus([_conv(["Tama likes tea.", memory])])
    assert not result.examples
    assert result.rejected[0]["reason"].startswith("memories[1]:"), result.rejected


def test_a_memory_at_the_limit_is_kept():
    result = read_corpus([_conv(["y" * 300])])
    assert not result.rejected and ("y" * 300) in result.examples[0].rendered.text
