"""Private training on the shared per-user ledger (Feldman & Zrnic, Section 5 and Appendix A).

* :mod:`~renyi_stream.stream.training.models`: multinomial logistic regression and a one-hidden-layer ReLU
  MLP with per-example gradient norms computed without materialising per-example gradients;
* :mod:`~renyi_stream.stream.training.dpgd`: Algorithms 6 and 7 (private gradient descent, with and without
  individual filtering) in one implementation;
* :mod:`~renyi_stream.stream.training.budget`: the ledger as seen by a training run (arrays per row);
* :mod:`~renyi_stream.stream.training.stopping`: Appendix A's stopping rule with private accuracy queries;
* :mod:`~renyi_stream.stream.training.normaliser`: what the update divides by (public, or a noisy user count);
* :mod:`~renyi_stream.stream.training.keyed_noise`: a run's noise derived from the curator's key (released once);
* :mod:`~renyi_stream.stream.training.idx`: the MNIST IDX file format.

NumPy on CPU, CuPy on GPU (``renyi_stream.stream.xp``), one code path.
"""
