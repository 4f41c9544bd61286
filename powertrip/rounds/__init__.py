"""The round machinery shared by the emulator and the aggregator service: the round loop
(Algorithm 1's outer loop), its journal, the clock, the emulated run and its memo."""
