"""Glue between the runtime and Spark: barrier-stage launcher, driver-side coordinator."""
