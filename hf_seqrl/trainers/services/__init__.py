"""What the trainers use besides their losses: the rollouts decoded ahead (`generation`), rollouts kept for
reuse (`reuse`), frozen models (`frozen`), the sample log (`completions`), checkpoints (`checkpoints`), adapters
(`adapters`), model and data inputs (`inputs`, `references`), the log window (`log_window`), what a run records
(`run_record`) and the trainer side of rewards (`reward_scorer`)."""
