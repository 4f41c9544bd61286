"""When a site is curtailed: the carbon-intensity threshold its windows open below, the hold
before they close, and the time a site takes to join (the curtailment paper's defaults)."""

THRESHOLD = 100.0  # gCO2/kWh: curtailed while MCI < 100 (the curtailment paper's θ)


HOLD_S = 600.0  # exit hysteresis: leave after MCI > threshold for this long


PROVISIONING_S = 240.0  # the paper's logged run (its code's current default is 300 s)
