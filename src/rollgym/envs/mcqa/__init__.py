"""Multiple-choice QA: reward 1 when the reply's chosen option letter is the expected one, graded
as NeMo Gym 0.4.0's ``mcqa`` grades (its grading modes and template regexes) or, for rollgym's
own rows, by the lenient ``rollgym_lenient`` extractor."""
