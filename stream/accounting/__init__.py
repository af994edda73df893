"""Privacy accounting: conversions, calibration, filters and odometers.

Pure functions and small objects, each citing the theorem it implements. Units: zCDP ``rho``
(the ledger's unit), GDP ``mu``, RDP at an order ``alpha``, and ``(epsilon, delta)``.
"""

from renyi_stream.stream.accounting.calibration import (
    ACCOUNTINGS,
    DEFAULT_ACCOUNTING,
    Calibration,
    calibrate,
    describe_accounting,
    epsilon_for_budget,
    noise_std_for,
    resume,
    zcdp_budget_for,
)
from renyi_stream.stream.accounting.conversions import (
    epsilon_to_gdp,
    epsilon_to_zcdp_cks,
    epsilon_to_zcdp_thm49,
    gdp_to_delta,
    gdp_to_epsilon,
    gdp_to_zcdp,
    rdp_to_delta,
    rdp_to_epsilon,
    zcdp_to_delta_cks,
    zcdp_to_delta_thm49,
    zcdp_to_epsilon_cks,
    zcdp_to_epsilon_thm49,
    zcdp_to_gdp,
)
from renyi_stream.stream.accounting.filters import (
    AdvancedCompositionFilter,
    DPFilterViaZCDP,
    GDPFilter,
    RenyiFilter,
    ZCDPFilter,
)
from renyi_stream.stream.accounting.gaussian import gaussian_charge
from renyi_stream.stream.accounting.odometers import (
    Odometer,
    filter_odometer,
    mixture_odometer,
    rogers_odometer,
    stitched_odometer,
    tracker_step_for,
    tracker_update,
)

__all__ = [
    "ACCOUNTINGS", "DEFAULT_ACCOUNTING", "Calibration", "calibrate", "describe_accounting",
    "epsilon_for_budget", "noise_std_for", "resume", "zcdp_budget_for",
    "epsilon_to_gdp", "epsilon_to_zcdp_cks", "epsilon_to_zcdp_thm49", "gdp_to_delta",
    "gdp_to_epsilon", "gdp_to_zcdp", "rdp_to_delta", "rdp_to_epsilon", "zcdp_to_delta_cks",
    "zcdp_to_delta_thm49", "zcdp_to_epsilon_cks", "zcdp_to_epsilon_thm49", "zcdp_to_gdp",
    "AdvancedCompositionFilter", "DPFilterViaZCDP", "GDPFilter", "RenyiFilter", "ZCDPFilter",
    "gaussian_charge",
    "Odometer", "filter_odometer", "mixture_odometer", "rogers_odometer", "stitched_odometer",
    "tracker_step_for", "tracker_update",
]
