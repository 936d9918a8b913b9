"""skattn.distill: a student fitted on a teacher's outputs (sequence-level distillation)."""

import copy

import pytest
from conftest import REVERSAL_PARAMS
from sklearn.utils.validation import NotFittedError

import serving
from skattn import Seq2Seq, distill
from skattn.distillation import teacher_targets
from skattn.metrics import exact_match


class Recorder(Seq2Seq):
    """A student that records what it was fitted on (and fits nothing)."""

    def fit(self, X, y):
        self.seen_ = (list(X), list(y))
        return self


class Mapping:
    """A teacher that answers from a dict (a stand-in for any object with ``predict``)."""

    def __init__(self, answers):
        self.answers = answers
        self.calls = []

    def predict(self, sources):
        self.calls.append(list(sources))
        return [self.answers[s if isinstance(s, str) else tuple(s)] for s in sources]


class Silent:
    """A teacher that answers nothing."""

    def predict(self, sources):
        return []


def test_the_student_is_fitted_on_each_distinct_source_and_the_teachers_output():
    teacher = Mapping({"ab": "BA", "c": "C", "d": "D"})
    student = distill(teacher, Recorder(), ["ab", "c", "ab", "d", "c"])
    assert teacher.calls == [["ab", "c", "d"]]  # repeats labelled once, in first-seen order
    assert student.seen_ == (["ab", "c", "d"], ["BA", "C", "D"])


def test_references_are_added_beside_the_teachers_pairs():
    teacher = Mapping({"ab": "BA", "c": "C"})
    student = distill(teacher, Recorder(), ["ab", "c", "ab"], ["ba", "c", "xy"])
    assert student.seen_ == (["ab", "c", "ab", "c", "ab"], ["BA", "C", "ba", "c", "xy"])


def test_outputs_holding_a_reserved_token_are_dropped():
    teacher = Mapping({("a",): ["A"], ("b",): ["<unk>", "B"], ("c",): ["C"]})
    X, outputs = teacher_targets(teacher, [["a"], ["b"], ["c"]], tokenizer="space")
    assert X == [["a"], ["c"]] and outputs == [["A"], ["C"]]
    with pytest.raises(ValueError, match="no usable output"):
        distill(Mapping({"b": "<unk> B"}), Recorder(tokenizer="space"), ["b"])


def test_a_distilled_student_learns_the_teachers_mapping(fitted_reversal, reversal_data):
    X_train, _, X_test, _ = reversal_data
    teacher = fitted_reversal
    student = Seq2Seq(**{**REVERSAL_PARAMS, "hidden_size": 32, "random_state": 1})
    assert distill(teacher, student, X_train) is student
    agreement = exact_match(teacher.predict(X_test), student.predict(X_test))
    assert agreement >= 0.9, agreement
    assert student.output_kind_ == "str"


def test_a_warm_started_student_continues_on_the_teachers_outputs(fitted_reversal, reversal_data):
    X_train = reversal_data[0][:64]
    student = copy.deepcopy(fitted_reversal).set_params(warm_start=True, max_epochs=1)
    epochs = student.n_iter_
    distill(fitted_reversal, student, X_train)
    assert student.n_iter_ == epochs + 1


def test_an_exported_runtime_teaches_as_its_estimator(fitted_reversal, reversal_data, tmp_path):
    X = reversal_data[2][:50]
    runtime = serving.load(fitted_reversal.export_onnx(tmp_path / "teacher"))
    assert teacher_targets(runtime, X) == teacher_targets(fitted_reversal, X)


def test_bad_arguments_get_a_clear_error(fitted_reversal):
    with pytest.raises(ValueError, match="teacher must have a predict method"):
        distill(object(), Recorder(), ["ab"])
    with pytest.raises(NotFittedError):
        distill(Seq2Seq(), Recorder(), ["ab"])
    with pytest.raises(ValueError, match="student must have a fit method"):
        distill(fitted_reversal, object(), ["ab"])
    with pytest.raises(ValueError, match="X must hold at least one item"):
        distill(fitted_reversal, Recorder(), [])
    with pytest.raises(ValueError, match="y must hold one reference per source"):
        distill(fitted_reversal, Recorder(), ["12", "34"], ["21"])
    with pytest.raises(ValueError, match="y must be a sequence of str or of token lists"):
        distill(fitted_reversal, Recorder(), ["12", "34"], "21")  # a str is not references
    with pytest.raises(ValueError, match=r"y must be of the kind the teacher outputs \(strings\)"):
        distill(fitted_reversal, Recorder(), ["12", "34"], [["2", "1"], ["4", "3"]])
    with pytest.raises(ValueError, match="returned 0 outputs for 1 sources"):
        distill(Silent(), Recorder(), ["ab"])
    with pytest.raises(
        ValueError, match=r"teacher.predict\(sources\) must be a sequence of outputs"
    ):
        teacher_targets(Mute(), ["ab"])
    for X in (["ab"], [["a", "b"]]):  # token lists too: the tokenizer is checked by its name
        with pytest.raises(ValueError, match="tokenizer must be one of"):
            teacher_targets(Mapping({}), X, tokenizer="word")


class Mute:
    """A teacher whose predict returns None."""

    def predict(self, sources):
        return None


def test_a_student_with_another_tokenizer_than_the_teacher_is_refused(fitted_reversal, tmp_path):
    """A "char" student would read a "space" teacher's phoneme strings letter by letter."""
    spaced = copy.deepcopy(fitted_reversal)
    spaced.tokenizer = spaced.tokenizer_ = "space"  # as if fitted on space-separated tokens
    with pytest.raises(
        ValueError, match="student's tokenizer='char' would read .*tokenizer='space'"
    ):
        distill(spaced, Recorder(), ["12"])
    runtime = serving.load(fitted_reversal.export_onnx(tmp_path / "teacher"))
    with pytest.raises(ValueError, match="tokenizer='space' would read .*tokenizer='char'"):
        distill(runtime, Recorder(tokenizer="space"), ["12"])
    assert distill(Mapping({"12": "21"}), Recorder(tokenizer="space"), ["12"]).seen_  # unknown
    # a teacher of token lists: its outputs are never split again, whatever the tokenizers
    tokens = Seq2Seq(hidden_size=8, embedding_dim=4, max_steps=2, device="cpu")
    tokens.fit([["ab", "c"], ["c"]], [["x"], ["y", "x"]])
    assert distill(tokens, Recorder(tokenizer="space"), [["ab", "c"]]).seen_
