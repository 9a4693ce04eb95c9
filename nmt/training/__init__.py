"""Training as train.py does it: the command line (`command`), the loop (`trainer`) and what
runs in it: where a run starts (`starting`), the run's corpus (`run_data`), the periodic work
registered with its interval (`hooks`), validation (`validation`), limits and signals
(`stopping`), metrics (`metrics_log`), the progress bar (`progress`), progress lines and the
summary (`summary`), the platform forecast (`platform_check`), and why training cannot go on
(`errors`)."""
