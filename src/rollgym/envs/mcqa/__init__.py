"""Multiple-choice QA: reward 1 when the reply's chosen option letter is the expected one."""
