"""The study's controls at equal budget: the simple methods a data-selection result must
beat, one module per control with its pure functions, its policy (where it has one) and
its method card (the docstring): ``random_subset``, ``short_schedule``,
``selective_backprop``, ``infobatch``, ``rs2``.

Each is a method of darel.methods (its declaration: training set, settings, plan at a
budget, selection); every method of a study cell gets the same budget B(t, m), the same
calibrated batch and a time plan from the same cost model, so a difference in accuracy
is a difference of the methods, not of the budgets.
"""
