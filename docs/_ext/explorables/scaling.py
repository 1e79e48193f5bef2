"""Chapter 4's explorable figure (Scaling): one query's row of scores at three head sizes, its weights with and
without the divisor sqrt(d_k) as two columns of bars."""

from __future__ import annotations

import numpy as np

from . import widgets

SCALING_HEAD_SIZES = (4, 64, 512)  # the selector's settings; 64 is the page's d_k
SCALING_DEFAULT = 64
SCALING_KEYS = 32  # S, as in the page's text
SCALING_SEED = 76  # the seed of the page's row: the chapter's text describes the default state, d_k = 64
_DK = "d\u2096"  # d with subscript k, typeset in plain text
_SQRT_DK = "\u221a" + _DK


def _entropy(weights) -> float:
    """Entropy in nats of a row of weights (0 log 0 = 0)."""
    logs = np.log(weights, where=weights > 0, out=np.zeros_like(weights))
    return float(-(weights * logs).sum())


def scaling_row(d_k, seed=SCALING_SEED, n_keys=SCALING_KEYS):
    """One query and `n_keys` keys of size `d_k` (standard normal, drawn in this order), and zero values: the
    same numbers as ``rng.standard_normal(d_k)`` then ``rng.standard_normal((n_keys, d_k))``."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, d_k))  # (L=1, E)
    k = rng.standard_normal((n_keys, d_k))  # (S, E)
    v = np.zeros((n_keys, 1))  # (S, 1): only the weights are shown
    return q, k, v


def scaling_selector(head_sizes=SCALING_HEAD_SIZES, default=SCALING_DEFAULT, seed=SCALING_SEED,
                     n_keys=SCALING_KEYS):
    """The scaling explorable: one query's weights over `n_keys` keys for each head size, as two columns of bars,
    divisor 1 (no scaling, ``scale=1``) beside divisor ``sqrt(d_k)`` (the package's default scale
    ``1/sqrt(d_k)``)."""
    import attention_ref as ar

    keys = [f"k{j}" for j in range(n_keys)]
    states, rows = {}, {}
    for d_k in head_sizes:
        q, k, v = scaling_row(d_k, seed, n_keys)
        raw = (q @ k.T)[0]  # (S,) the unscaled scores: their spread is in the summary
        _, w_raw = ar.scaled_dot_product_attention(q, k, v, scale=1.0, return_weights=True)
        _, w_scaled = ar.scaled_dot_product_attention(q, k, v, return_weights=True)  # default scale 1/sqrt(E)
        w_raw, w_scaled = w_raw[0], w_scaled[0]  # (S,) each
        root = float(np.sqrt(d_k))
        top_raw, top_scaled = int(np.argmax(w_raw)), int(np.argmax(w_scaled))
        h_raw, h_scaled = _entropy(w_raw), _entropy(w_scaled)
        states[widgets.key(d_k)] = {
            "text": {"root": f"{root:.3g}", "sd": f"{float(raw.std()):.1f}",
                     "max-raw": f"{w_raw[top_raw]:.2f}", "arg-raw": keys[top_raw], "ent-raw": f"{h_raw:.2f}",
                     "max-scaled": f"{w_scaled[top_scaled]:.2f}", "arg-scaled": keys[top_scaled],
                     "ent-scaled": f"{h_scaled:.2f}"},
            "bars": {"raw": widgets.bars(w_raw), "scaled": widgets.bars(w_scaled)},
            "status": f"{_DK} = {d_k}: with no scaling the largest weight is {w_raw[top_raw]:.2f} (entropy "
                      f"{h_raw:.2f} nats); divided by {_SQRT_DK} = {root:.3g} it is {w_scaled[top_scaled]:.2f} "
                      f"(entropy {h_scaled:.2f} of at most {np.log(n_keys):.2f}). The larger {_DK}, the sharper "
                      "the unscaled weights; the scaled ones stay spread.",
        }
        rows[d_k] = (w_raw, w_scaled)
    columns = (widgets.bar_list("raw", "Divisor 1 (no scaling)", keys)
               + widgets.bar_list("scaled", f"Divisor {_SQRT_DK}", keys))
    summary = (f'<p class="ex-summary">Divisor 1 (no scaling): largest weight <span data-slot="max-raw"></span> on '
               '<span data-slot="arg-raw"></span>, entropy <span data-slot="ent-raw"></span> nats. Divisor '
               f'{_SQRT_DK} = <span data-slot="root"></span>: largest weight <span data-slot="max-scaled"></span> on '
               '<span data-slot="arg-scaled"></span>, entropy <span data-slot="ent-scaled"></span> nats. Uniform '
               f"weights would be {1 / n_keys:.2f} each, entropy {np.log(n_keys):.2f} nats. The unscaled scores "
               'have standard deviation <span data-slot="sd"></span> in this row.</p>')
    page = widgets.page(
        "scaling", f"One query's weights over {n_keys} keys, with and without the divisor {_SQRT_DK}",
        [widgets.select("dk", f"Head size {_DK}", [(str(d), str(d)) for d in head_sizes], str(default))],
        f'{summary}<div class="ex-pair">{columns}</div>', states, ["dk"], widgets.key(default),
        intro=f"Choose the head size {_DK}. The two columns of bars are the same query's weights over the same "
              f"keys: divisor 1 is no scaling, divisor {_SQRT_DK} is the package's default scale 1/{_SQRT_DK}.",
    )
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4.4), layout="constrained")
    axes = fig.subplots(2, len(head_sizes), sharey=True)
    for col, d_k in enumerate(head_sizes):
        for row, (w, label) in enumerate(zip(rows[d_k], ("divisor 1 (no scaling)", r"divisor $\sqrt{d_k}$"),
                                             strict=True)):
            ax = axes[row, col]
            ax.bar(range(n_keys), w)
            ax.set_ylim(0, 1)
            ax.set_title(f"$d_k$ = {d_k}, {label}", fontsize=9)
            ax.set_xlabel("key", fontsize=8)
        axes[0, col].tick_params(labelsize=7)
        axes[1, col].tick_params(labelsize=7)
    axes[0, 0].set_ylabel("weight")
    axes[1, 0].set_ylabel("weight")
    big = {d: rows[d][0].max() for d in head_sizes}
    spread = {d: rows[d][1].max() for d in head_sizes}
    assert all(np.diff([big[d] for d in head_sizes]) > 0), "the alt text says the unscaled weights sharpen"
    assert max(spread.values()) < 0.5, "the alt text says the scaled weights stay spread"
    alt = (f"Six bar charts of one query's weights over {n_keys} keys, for head sizes "
           f"{', '.join(str(d) for d in head_sizes)} left to right. Top row, no scaling: the largest weight grows "
           f"with the head size, {', '.join(f'{big[d]:.2f}' for d in head_sizes)}, until one bar holds almost all "
           "the weight. Bottom row, scores divided by the square root of the head size: the weight stays spread over "
           f"many keys, the largest {', '.join(f'{spread[d]:.2f}' for d in head_sizes)}.")
    return widgets.Explorable("scaling", page, widgets.png_of(fig), alt)
