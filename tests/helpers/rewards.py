"""A user reward reached by dotted path (`tests.helpers.rewards.vowel_fraction`): varies even on random text,
so the tiny random model gets non-zero advantages and its weights really change."""


def vowel_fraction(completions, **kwargs):
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch in "aeiouAEIOU" for ch in t) / max(1, len(t)) for t in texts]
