"""Training as train.py does it: the command line (`command`), the loop (`trainer`) and what
runs in it: the run's data (`run_data`), validation (`validation`), limits and signals
(`stopping`), metrics (`metrics_log`), progress and the summary (`summary`), the platform
forecast (`platform_check`)."""
