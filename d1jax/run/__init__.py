"""What every stage (train, eval, plan) uses: the typed run spec translated once from a
config (``spec``), building tokenizer, model and params (``build``), the optimizer
(``optim``), and the run context with checkpoints, resume checks, metrics and export
(``context``, ``resume``)."""
