"""Task specs: built-in tasks, file round trips, validation and prompt rendering."""

from __future__ import annotations

import numpy as np
import pytest

from wasp_vllm.tasks import (
    PROMPT_KINDS,
    TaskError,
    TaskSpec,
    build_prompt,
    draw_contrastive_examples,
    get_task,
    list_tasks,
    pick_attribute,
    save_task,
    task_from_dict,
)

PAPER_TASKS = {"imdb", "yelp_category", "yelp_rating", "openreview_category", "openreview_rating", "banking"}
GOOD = ["a good synthetic sample", 'one with "quotes" inside', "line one\n\nline two"]
BAD = ["a bad synthetic sample", "another bad one"]


def _minimal(**overrides) -> dict:
    data = {
        "name": "mini",
        "labels": ["yes", "no"],
        "templates": {
            "zero_shot": 'Say {label_text}: "',
            "few_shot": '{examples}\nAnother {label_text}: "',
            "contrastive": '{bad_examples}\n{good_examples}\nA better {label_text}: "',
        },
    }
    data.update(overrides)
    return data


def _render(task: TaskSpec, kind: str, label: str, attribute: str | None) -> str:
    if kind == "zero_shot":
        return build_prompt(task, kind, label, attribute)
    if kind == "few_shot":
        return build_prompt(task, kind, label, attribute, good=GOOD)
    return build_prompt(task, kind, label, attribute, good=GOOD, bad=BAD)


def test_builtin_tasks_listed():
    names = list_tasks()
    assert PAPER_TASKS | {"drugs"} <= set(names)
    assert names == sorted(names)


@pytest.mark.parametrize("name", sorted(PAPER_TASKS | {"drugs"}))
def test_every_builtin_builds_all_prompt_kinds(name):
    task = get_task(name)
    rng = np.random.default_rng(0)
    for label in task.labels:
        attribute = pick_attribute(task, label, rng)
        assert (attribute is None) == (task.attribute_name is None)
        for kind in PROMPT_KINDS:
            prompt = _render(task, kind, label, attribute)
            # The continuation is the sample: the prompt ends with an opening quote.
            assert prompt.endswith('"'), (name, kind)
            assert task.label_text(label) in prompt
            if attribute is not None:
                assert attribute in prompt
            assert "{" not in prompt.replace("{text}", "")  # no unrendered placeholder
        few = _render(task, "few_shot", label, attribute)
        assert GOOD[0] in few and BAD[0] not in few
        con = _render(task, "contrastive", label, attribute)
        assert GOOD[0] in con and BAD[0] in con
        assert con.index(BAD[0]) < con.index(GOOD[0])


def test_paper_task_shapes():
    assert get_task("imdb").labels == ["positive", "negative"]
    assert get_task("imdb").attribute_name == "genre"
    assert len(get_task("yelp_category").labels) == 10
    assert get_task("yelp_category").attribute_values == ["1.0", "2.0", "3.0", "4.0", "5.0"]
    assert len(get_task("yelp_rating").labels) == 5
    assert len(get_task("openreview_category").labels) == 12
    assert len(get_task("openreview_rating").labels) == 5
    banking = get_task("banking")
    assert len(banking.labels) == 10 and banking.labels[0] == "activate_my_card"
    assert banking.attribute_name is None
    assert get_task("drugs").labels == ["positive", "neutral", "negative"]


def test_name_lookup_is_forgiving_and_unknown_names_list_known():
    assert get_task("Yelp-Rating").name == "yelp_rating"
    with pytest.raises(TaskError) as err:
        get_task("no_such_task")
    assert "imdb" in str(err.value) and "banking" in str(err.value)


@pytest.mark.parametrize("suffix", [".toml", ".yaml", ".yml"])
@pytest.mark.parametrize("name", ["imdb", "openreview_category", "banking"])
def test_round_trip_through_files(tmp_path, name, suffix):
    task = get_task(name)
    path = save_task(task, tmp_path / f"custom{suffix}")
    again = get_task(str(path))
    assert again == task
    assert build_prompt(again, "contrastive", task.labels[1], good=GOOD, bad=BAD) == build_prompt(
        task, "contrastive", task.labels[1], good=GOOD, bad=BAD
    )


def test_hand_written_yaml(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(
        "name: mine\nlabels: [spam, ham]\nattribute_name: topic\n"
        "label_attribute_values: {spam: [offers], ham: [family, work]}\n"
        "attribute_template: ' about {attribute}'\n"
        "templates:\n"
        "  zero_shot: 'An email that is {label}{attribute_text}: \"'\n"
        '  few_shot: "{examples}\\nAnother {label} email: \\""\n'
        '  contrastive: "{bad_examples}\\n{good_examples}\\nA better {label} email: \\""\n',
        encoding="utf-8",
    )
    task = get_task(str(path))
    assert build_prompt(task, "zero_shot", "spam", "offers") == 'An email that is spam about offers: "'
    rng = np.random.default_rng(1)
    assert {pick_attribute(task, "ham", rng) for _ in range(50)} == {"family", "work"}
    assert pick_attribute(task, "spam", rng) == "offers"


def test_unknown_keys_rejected(tmp_path):
    with pytest.raises(TaskError, match="colour.*unknown key"):
        task_from_dict(_minimal(colour="red"))
    bad_templates = _minimal()
    bad_templates["templates"]["zero_shot_typo"] = "x"
    with pytest.raises(TaskError, match="zero_shot_typo.*unknown key"):
        task_from_dict(bad_templates)
    path = tmp_path / "t.toml"
    path.write_text('name = "x"\nlabel = ["a", "b"]\n', encoding="utf-8")
    with pytest.raises(TaskError, match=r"t\.toml"):
        get_task(str(path))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"labels": ["a", "a"]}, "unique"),
        ({"labels": ["only"]}, "labels"),
        ({"name": "Has Space"}, "name"),
        ({"label_descriptions": {"maybe": "x"}}, "not labels"),
        ({"label_aliases": {"yes": ["no"]}}, "claimed by both"),
        ({"attribute_values": ["x"]}, "attribute_name"),
        ({"attribute_name": "topic"}, "no values"),
        ({"stop": []}, "stop"),
    ],
)
def test_invalid_specs(overrides, message):
    with pytest.raises(TaskError, match=message):
        task_from_dict(_minimal(**overrides))


@pytest.mark.parametrize(
    ("template", "value", "message"),
    [
        ("few_shot", 'No examples here: "', "must contain"),
        ("contrastive", '{good_examples} only: "', "bad_examples"),
        ("zero_shot", 'Say {lable}: "', "unknown placeholder"),
        ("zero_shot", 'Say {label_text}: " ', "trailing whitespace"),
        ("zero_shot", 'Say {label_text!r}: "', "format spec"),
    ],
)
def test_invalid_templates(template, value, message):
    data = _minimal()
    data["templates"][template] = value
    with pytest.raises(TaskError, match=message):
        task_from_dict(data)


def test_unreadable_files(tmp_path):
    with pytest.raises(TaskError, match="does not exist"):
        get_task(str(tmp_path / "missing.toml"))
    broken = tmp_path / "broken.toml"
    broken.write_text("name = [unclosed\n", encoding="utf-8")
    with pytest.raises(TaskError, match="invalid TOML"):
        get_task(str(broken))
    listy = tmp_path / "list.yaml"
    listy.write_text("- a\n- b\n", encoding="utf-8")
    with pytest.raises(TaskError, match="mapping"):
        get_task(str(listy))
    with pytest.raises(TaskError, match="extension"):
        get_task(str(tmp_path / "task.json"))


def test_build_prompt_validates_requests():
    task = get_task("banking")
    with pytest.raises(TaskError, match="no label"):
        build_prompt(task, "zero_shot", "not_an_intent")
    with pytest.raises(TaskError, match="kind"):
        build_prompt(task, "two_shot", "age_limit")
    with pytest.raises(TaskError, match="no examples"):
        build_prompt(task, "zero_shot", "age_limit", good=GOOD)
    with pytest.raises(TaskError, match="good examples only"):
        build_prompt(task, "few_shot", "age_limit", good=GOOD, bad=BAD)
    with pytest.raises(TaskError, match="at least one good"):
        build_prompt(task, "contrastive", "age_limit", bad=BAD)
    with pytest.raises(TaskError, match="sequence"):
        build_prompt(task, "few_shot", "age_limit", good="just one string")


def test_examples_cannot_trigger_stop_strings():
    task = get_task("imdb")
    prompt = build_prompt(task, "contrastive", "positive", good=GOOD, bad=[])
    body = prompt[:-1]  # everything but the final opening quote
    assert "\n\n" not in prompt
    assert "'quotes'" in body
    assert not prompt.startswith("\n")  # an empty bad block leaves no blank first line


def test_draw_counts():
    rng = np.random.default_rng(0)
    good_pool = [f"g{i}" for i in range(10)]
    bad_pool = [f"b{i}" for i in range(10)]
    for s, (n_good, n_bad) in {0: (0, 0), 1: (1, 0), 2: (1, 1), 5: (3, 2), 8: (4, 4)}.items():
        good, bad = draw_contrastive_examples(good_pool, bad_pool, s, rng)
        assert (len(good), len(bad)) == (n_good, n_bad)
        assert len(set(good)) == len(good) and set(good) <= set(good_pool)
        assert len(set(bad)) == len(bad) and set(bad) <= set(bad_pool)
    good, bad = draw_contrastive_examples(good_pool[:2], bad_pool[:1], 8, rng)
    assert sorted(good) == ["g0", "g1"] and bad == ["b0"]
    assert draw_contrastive_examples([], [], 4, rng) == ([], [])
    with pytest.raises(TaskError):
        draw_contrastive_examples(good_pool, bad_pool, -1, rng)


def test_draw_randomness_fresh_per_call_and_seeded():
    pool_g = [f"g{i}" for i in range(30)]
    pool_b = [f"b{i}" for i in range(30)]
    rng = np.random.default_rng(7)
    draws = [draw_contrastive_examples(pool_g, pool_b, 6, rng) for _ in range(5)]
    assert len({tuple(g) + tuple(b) for g, b in draws}) > 1
    rng_again = np.random.default_rng(7)
    assert [draw_contrastive_examples(pool_g, pool_b, 6, rng_again) for _ in range(5)] == draws


def test_pick_attribute_covers_values_and_is_seeded():
    task = get_task("yelp_category")
    picks = [pick_attribute(task, "Bars", np.random.default_rng(s)) for s in range(200)]
    assert set(picks) == set(task.attribute_values)
    assert pick_attribute(task, "Bars", np.random.default_rng(3)) == pick_attribute(
        task, "Bars", np.random.default_rng(3)
    )
    assert pick_attribute(get_task("banking"), "age_limit", np.random.default_rng(0)) is None
    with pytest.raises(TaskError):
        pick_attribute(task, "Nightclubs", np.random.default_rng(0))


def test_task_spec_is_frozen():
    task = get_task("imdb")
    with pytest.raises(Exception):  # noqa: B017 - pydantic raises its own ValidationError type
        task.name = "other"
