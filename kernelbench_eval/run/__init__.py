"""Run orchestration: plan, schedule onto lanes (local or Ray), drive build -> judge -> record."""
