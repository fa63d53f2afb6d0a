"""Review 60 (train): a conversation id the eval split cannot group back is refused by the corpus builder.

Was: `hearth corpus build` took any string as a conversation's ``id`` and named its examples ``ID#TURN``, while
`hearth train --eval-fraction` groups the examples of a conversation by that name with ``(.+)#\\d+``
(batches.conversation_of). An empty id gave ``#1``, ``#3``, ... and an id holding a line break gave names the
pattern does not match: each example was then a conversation of its own, and the split held out some turns of a
conversation while it trained on the others (the leak review 53c closed for every other id).
"""

from __future__ import annotations

import pytest

from hearth.train.batches import Example, conversation_of
from hearth.train.corpus import read_corpus
from tests.train.test_train_review52l_corpus_input import GOOD, _with


@pytest.mark.parametrize("conv_id", ["", "   ", "sol\narlo", "line\n#2"])
def test_an_id_the_split_cannot_group_back_is_a_rejected_line_naming_id(conv_id):
    result = read_corpus([GOOD, _with("id", conv_id)])
    assert [r["line"] for r in result.rejected] == [2], result.rejected
    assert result.rejected[0]["reason"].startswith("id:"), result.rejected[0]
    assert len(result.examples) == len(read_corpus([GOOD]).examples)


@pytest.mark.parametrize("conv_id", ["sol-arlo", "a#1", "a#b", " padded ", "émile 😀"])
def test_every_example_of_an_accepted_conversation_is_grouped_as_one(conv_id):
    examples = read_corpus([_with("id", conv_id)]).examples
    assert len(examples) > 1
    groups = {conversation_of(Example([1, 2], [-100, 2], e.line, e.id)) for e in examples}
    assert groups == {conv_id}
