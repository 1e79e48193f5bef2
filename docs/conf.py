"""Sphinx configuration for the attention_ref book (minimal; extended by the book issue)."""

project = "attention_ref"
author = "The attention_ref developers"
copyright = "2026, The attention_ref developers"
extensions = ["myst_nb"]
html_theme = "sphinx_book_theme"
exclude_patterns = ["_build", "**.ipynb_checkpoints", "jupyter_execute"]
nb_execution_mode = "cache"
nb_execution_raise_on_error = True
