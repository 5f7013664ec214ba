"""Controls at equal budget: the simple methods a data-selection result must beat.

Each method gets the same budget B(t, m) as DAREL, the same calibrated batch size and a
time plan from the same cost model (its own epoch costs, the same measured terms), so a
difference in accuracy is a difference of the methods, not of the budgets:

==================  ==============================================  =====================
method              offline subset                                  online stage
==================  ==============================================  =====================
darel               Algorithm 2 (loss-ranked alpha per class)       Algorithm 3 (histogram)
random-offline      random alpha per class (seeded)                 Algorithm 3
uniform-online      Algorithm 2                                     keep with prob. A
random              random alpha per class                          keep with prob. A
short-schedule      all data                                        none; epochs that fit
                                                                    t_max, LR to zero
selective-backprop  all data                                        Jiang et al. 2019
infobatch           all data                                        Qin et al. 2024
==================  ==============================================  =====================

One module per method holds its pure functions and its method card (the docstring):
``random_subset``, ``short_schedule``, ``selective_backprop``, ``infobatch``; the plan of
every method from a calibration is ``darel.plans.method_plan``.
"""

from darel.config import CONTROL_METHODS as METHODS  # noqa: F401 (the schema's list is the one list)
