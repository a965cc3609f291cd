"""Time: hardware profiles, the compute cost model, and the virtual and wall clocks."""
