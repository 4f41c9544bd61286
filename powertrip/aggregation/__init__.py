"""Turning a round's site updates into the next global model: the streaming FedAvg fold
(Eq. 2), the checks every update meets, the robust rules that bound a hostile site, and the
optional DiLoCo outer step."""
