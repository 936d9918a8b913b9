import subprocess
import sys

import matplotlib
import numpy as np
import pytest

from skattn.plotting import plot_attention

matplotlib.use("Agg")


@pytest.fixture
def close_figures():
    import matplotlib.pyplot as plt

    yield
    plt.close("all")


def _labels(ticklabels):
    return [t.get_text() for t in ticklabels]


def test_plot_renders_png_with_tick_labels(tmp_path, close_figures):
    source = ["1", "2", "3", "</s>"]
    output = ["3", "2", "1"]
    weights = np.eye(3, 4)[::-1]  # anti-diagonal band over the digits
    ax = plot_attention(weights, source, output, title="reversal", annotate=True)
    assert _labels(ax.get_xticklabels()) == source
    assert _labels(ax.get_yticklabels()) == output
    assert ax.get_title() == "reversal"
    np.testing.assert_array_equal(ax.images[0].get_array(), weights)
    path = tmp_path / "attention.png"
    ax.figure.savefig(path)
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 1000


def test_plot_draws_on_given_axes(close_figures):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2)
    ax = plot_attention([[1.0, 0.0]], ["a", "b"], ["x"], ax=axes[1], colorbar=False)
    assert ax is axes[1]
    assert len(axes[1].images) == 1 and len(axes[0].images) == 0
    assert len(fig.axes) == 2  # no colour bar added


@pytest.mark.parametrize(
    ("weights", "source", "output", "name"),
    [
        (np.ones((2, 3)), ["a", "b"], ["x", "y"], "source_tokens"),
        (np.ones((2, 3)), ["a", "b", "c"], ["x"], "output_tokens"),
        (np.ones(3), ["a", "b", "c"], ["x"], "weights"),
    ],
)
def test_plot_validates_shapes(weights, source, output, name):
    with pytest.raises(ValueError, match=name):
        plot_attention(weights, source, output)


def test_importing_plot_does_not_import_matplotlib():
    code = "import sys, skattn.plotting; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_docstring_examples():
    import doctest

    import skattn.plotting

    result = doctest.testmod(skattn.plotting)
    assert result.attempted > 0 and result.failed == 0


def test_the_old_module_name_is_the_same_function():
    # DESIGN.md's layout names skattn.plotting; code written for skattn 0.1 imports skattn.plot
    import skattn.plot
    import skattn.plotting

    assert skattn.plot.plot_attention is skattn.plotting.plot_attention
